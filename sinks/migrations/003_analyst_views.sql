-- superseded-checksum: 24cc51c29cf26810 (this file before its views moved to sinks/views/, one file per view,
-- applied after the migrations on every `gpuledger db migrate`)

-- Views for analysts and for the CLI reports (the CLI reads these same views, so the two never
-- disagree). Money is exact: rates are integer micro-dollars per GPU-hour; a line's charge is
-- sum(seconds x rate) / 3.6e9 dollars, rounded half-up to the cent once per report line.
