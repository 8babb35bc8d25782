"""The run-record file formats, one module each: its schema, file names, reader and writer.

`decisions` (decisions-rank<r>.jsonl), `client` (client.json), `manifest` (manifest.json),
`seal` (the seal inside the manifest), over `files` (safe, strict, read-once file access).
Nothing here knows the policy's arms or analyses a record: `residency.rundir` builds the run
model from these readers, `residency.policy` writes decisions through `decisions`."""
