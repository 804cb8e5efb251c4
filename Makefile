# The two commands of the README, plus a few conveniences.
.PHONY: setup up down status test lint

setup:
	./local/setup.sh

up: setup  ## bring the whole local platform up and drive a burst of likes through it
	.venv/bin/likes local up
	.venv/bin/likes local demo

down:
	.venv/bin/likes local down

status:
	.venv/bin/likes local status

test:  ## lint gate + all tests on a real local stack
	./local/check.sh

lint: setup
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy
