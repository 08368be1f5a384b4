"""
Reading and writing realm-hf's files and saved directories, one module per concept: files written whole
(`atomic`), their checksums (`checksums`), paths that must stay inside their folder (`paths`), JSON lines
(`json_lines`), directory locks (`locks`), journaled all-or-nothing saves and their recovery (`staged_saves`), loads
that read exactly one save (`consistent_reads`), and the `auto_map` saved configs and tokenizers carry (`auto_map`).
Import the functions from their modules; nothing is re-exported here.
"""
