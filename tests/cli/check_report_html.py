#!/usr/bin/env python3
"""Checks that a run report (meshtrain report) is a valid, self-contained
HTML5 page: the doctype first; every element closed in order (void elements
and SVG's self-closed ones aside); one html, head, title and body; no script,
no src or href attribute, no URL but SVG's namespace; every & an entity; and
smaller than MAX_BYTES (default 2 MB).
Usage: check_report_html.py FILE [MAX_BYTES]; prints the problems, exits 1 on any."""
import re
import sys
from html.parser import HTMLParser

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class Checker(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.problems, self.counts = [], [], {}

    def where(self):
        return "line %d" % self.getpos()[0]

    def attributes(self, tag, attrs):
        self.counts[tag] = self.counts.get(tag, 0) + 1
        if tag == "script":
            self.problems.append("%s: a <script>" % self.where())
        for name, value in attrs:
            if name in ("src", "href"):
                self.problems.append("%s: <%s %s=...> refers to another resource" % (self.where(), tag, name))
            if value and "://" in value and not (name == "xmlns" and value == "http://www.w3.org/2000/svg"):
                self.problems.append("%s: <%s %s=%r> holds a URL" % (self.where(), tag, name, value))

    def handle_starttag(self, tag, attrs):
        self.attributes(tag, attrs)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.attributes(tag, attrs)
        if tag not in VOID and "svg" not in self.stack:
            self.problems.append("%s: <%s/> self-closed outside SVG" % (self.where(), tag))

    def handle_endtag(self, tag):
        if tag in VOID:
            self.problems.append("%s: </%s> ends a void element" % (self.where(), tag))
        elif not self.stack or self.stack[-1] != tag:
            self.problems.append("%s: </%s> but the open element is <%s>" % (self.where(), tag,
                                                                              self.stack[-1] if self.stack else ""))
        else:
            self.stack.pop()


def check(path, max_bytes):
    raw = open(path, "rb").read()
    text = raw.decode("utf-8")  # raises on bad UTF-8
    c = Checker()
    if not text.startswith("<!DOCTYPE html>\n"):
        c.problems.append("the page does not start with <!DOCTYPE html>")
    if len(raw) >= max_bytes:
        c.problems.append("%d bytes, not under %d" % (len(raw), max_bytes))
    for m in re.finditer(r"&(?!(amp|lt|gt|quot|#39|#\d+);)", text):
        c.problems.append("a bare & at offset %d: %r" % (m.start(), text[m.start():m.start() + 20]))
    c.feed(text)
    c.close()
    if c.stack:
        c.problems.append("unclosed at the end: %s" % c.stack)
    for tag in ("html", "head", "title", "body"):
        if c.counts.get(tag, 0) != 1:
            c.problems.append("%d <%s> elements, not 1" % (c.counts.get(tag, 0), tag))
    return c.problems


if __name__ == "__main__":
    problems = check(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2_000_000)
    for p in problems:
        print("%s: %s" % (sys.argv[1], p))
    sys.exit(1 if problems else 0)
