"""The benchmarks behind ``konduit bench`` (see docs/benchmarks.md); not part of the API.

:mod:`~konduit.bench.suite` runs them; :mod:`~konduit.bench.fleet`, :mod:`~konduit.bench.fair`,
:mod:`~konduit.bench.maps` and :mod:`~konduit.bench.soak` drive worker processes serving the
apps of :mod:`~konduit.bench.apps`; :mod:`~konduit.bench.harness` drives the completer directly.
The package imports only downward (the runtime, never the command line or the web app): worker
processes are started as commands. Empty on purpose, so a worker process that imports
``konduit.bench.apps`` loads nothing of the benchmarks themselves."""
