"""The run's configuration: from the command line (Hydra's compose) to validated dataclasses, every check before
any work."""
