"""The cronlog worker: claims runs placed on it, executes them under a supervisor,
reports to the ledger, and fences itself when it cannot prove it is alive."""
