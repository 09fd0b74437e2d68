"""The lab beside the library: one package per experiment (run scripts, summarizer, README); records in docs/results."""
