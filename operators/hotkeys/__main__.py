from operators.hotkeys.local_loop import main

main()
