"""The pure core: definitions, policies, the fan-in decision and the outcome policy. Nothing here
touches the database or the clock of a worker; everything is unit- and property-testable."""
