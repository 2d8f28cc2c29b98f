-- superseded-checksum: b28c16dc13c28cc5 (this file before its views moved to sinks/views/, one file per view,
-- applied after the migrations on every `gpuledger db migrate`)

