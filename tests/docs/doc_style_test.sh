#!/usr/bin/env bash
# The user documentation stays readable: README.md is at most 150 lines, and
# no paragraph, list item or table row of README.md or docs/*.md holds more
# than 120 words. Fenced code blocks are not counted; a heading ends a
# paragraph; each list item (a line starting with -, * or 1.) and each table
# row (a line starting with |) is counted on its own.
# Usage: doc_style_test.sh SOURCE_DIR [MAX_WORDS]
set -u
src=$1 max_words=${2:-120} max_readme_lines=150
cd "$src" || { echo "FAIL: no source folder $src"; exit 1; }
failures=0

lines=$(wc -l < README.md)
if [ "$lines" -gt "$max_readme_lines" ]; then
  echo "FAIL: README.md has $lines lines (at most $max_readme_lines)"
  failures=$((failures + 1))
fi

for file in README.md docs/*.md; do
  [ -f "$file" ] || continue
  # Prints FILE:LINE: N words: first words... for each block over the limit.
  report=$(awk -v max="$max_words" -v file="$file" '
    function flush() {
      if (words > max) printf "%s:%d: %d words: %s...\n", file, start, words, substr(text, 1, 70)
      words = 0; text = ""; start = 0
    }
    function add(line) {
      if (start == 0) start = NR
      words += split(line, parts, /[ \t]+/) - (line ~ /^[ \t]/) - (line ~ /[ \t]$/)
      if (text == "") text = line
    }
    /^[ \t]*(```|~~~)/ { flush(); fenced = !fenced; next }
    fenced { next }
    /^[ \t]*$/ { flush(); next }
    /^#/ { flush(); next }
    /^[ \t]*\|/ { flush(); add($0); flush(); next }
    /^[ \t]*([-*+]|[0-9]+[.)])[ \t]/ { flush(); add($0); next }
    { add($0) }
    END { flush() }
  ' "$file")
  if [ -n "$report" ]; then
    echo "FAIL: blocks over $max_words words:"
    echo "$report"
    failures=$((failures + $(wc -l <<<"$report")))
  fi
done

[ "$failures" -eq 0 ] || { echo "FAIL: $failures problem(s)"; exit 1; }
echo "PASS: README.md has $lines lines; no block of README.md or docs/*.md is over $max_words words"
