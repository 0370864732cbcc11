"""What the tests share: worker threads and processes (``workers``), database reads (``db``),
waiting for a condition with a deadline (``waiting``), the browser of the dashboard tests
(``browser``) and a webhook receiver (``webhooks``). The apps that worker processes run live in
``tests/apps``."""
