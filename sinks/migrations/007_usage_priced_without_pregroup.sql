-- superseded-checksum: 0ca24d61160fb25e (this file before its views moved to sinks/views/, one file per view,
-- applied after the migrations on every `gpuledger db migrate`)

