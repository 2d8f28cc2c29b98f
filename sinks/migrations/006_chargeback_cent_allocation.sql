-- superseded-checksum: d42a49accb8772be (this file before its views moved to sinks/views/, one file per view,
-- applied after the migrations on every `gpuledger db migrate`)

