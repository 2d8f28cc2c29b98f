-- superseded-checksum: aa60a4937d0fd835 (this file before its views moved to sinks/views/, one file per view,
-- applied after the migrations on every `gpuledger db migrate`)

