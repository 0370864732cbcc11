"""The apps that worker-process tests run (``konduit worker tests.apps.<name>:app``) and import
for their workflows: one module per scenario, importable in the test process and in a worker."""
