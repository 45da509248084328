"""Example jobs, shipped in the wheel as package data: ``demo.yaml`` is what
``cronlog run`` registers unless told otherwise (``connectors.stack.paths.DEMO``)."""
