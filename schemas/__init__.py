"""Avro schemas and codecs of the records cronlog writes (issue 3)."""
