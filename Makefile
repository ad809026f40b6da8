# The two commands of the README. Both do their own set-up (scripts/setup.sh is idempotent).
.PHONY: setup demo test bench

setup:
	bash scripts/setup.sh

demo: setup
	.venv/bin/easyvideor1 demo --out runs/demo

# -n $(TEST_WORKERS): pytest-xdist workers, one per core (scripts/test_workers.sh says why and
# when fewer), a test file each at a time (--dist loadfile keeps a file's module fixtures in one
# process); --no-loadscope-reorder keeps the order tests/conftest.py gives (longest files first;
# xdist would otherwise start with the files of most tests, and the long files of two tests each
# ran last, alone); --durations=20 prints the slowest tests so growth shows when it happens.
TEST_WORKERS ?= $(shell bash scripts/test_workers.sh)
test: setup
	OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1 .venv/bin/python -m pytest -q -p no:cacheprovider \
		-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=20 tests

bench: setup
	for b in benchmarks/*.py; do OMP_WAIT_POLICY=PASSIVE .venv/bin/python $$b || exit 1; done
