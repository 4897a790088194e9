# CLI tests (filled below)
