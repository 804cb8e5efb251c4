"""Game days: the seed's failure modes (catalog.yaml), one Chaos Toolkit experiment per enactable
mode (experiments/), run against the local stack with real faults by `likes chaos`."""
