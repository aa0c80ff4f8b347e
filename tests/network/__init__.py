"""Network faults for the integration tests: Toxiproxy between the processes and the
servers (:mod:`.toxiproxy`)."""
