"""How every result is shown: the units it is written in (`units`: seconds, bytes, rates) and the kit its text and
escaped HTML are built from (`kit`: code blocks that never break a word, tables with numbers right-aligned,
findings). Pure Python."""
