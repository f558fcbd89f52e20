"""``python -m benchmarks``: the one benchmark command (:mod:`benchmarks.bench`)."""

from benchmarks.bench import main

main()
