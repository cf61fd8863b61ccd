"""Run the intervention-overhead and load-time benchmarks: `python bench/interventions.py` (= `lmlab bench`)."""

from lmlab.cli import main

if __name__ == "__main__":
    main(["bench", "--only", "interventions", "--only", "load"])
