#!/usr/bin/env python3
"""Turns perlfaq POD pages into a chat-format JSONL Q/A set (stdlib only).

Each `=head2` heading of perlfaq1..9 is a question; its answer is everything up to the next
`=head1`/`=head2`. Lines: {"messages": [{"role": "user", "content": Q},
{"role": "assistant", "content": A}]}. The split is fixed and deterministic: items are
numbered in file order (perlfaq1 first) and every 10th item (index % 10 == 9) goes to
validation. POD formatting codes are rendered as plain text (C<x> -> `x`, L<...> -> its
text, E<lt> -> <, ...); prose paragraphs are re-flowed onto one line; verbatim (indented) code
blocks are kept as they are.

Usage: fetch-data-perlfaq.py --train OUT --val OUT perlfaq1.pod ... perlfaq9.pod
"""
import argparse
import json
import os
import re
import sys

ESCAPES = {"lt": "<", "gt": ">", "verbar": "|", "sol": "/", "quot": '"', "amp": "&", "apos": "'"}


def _render_link(body):
    # L<text|target>, L<name/"sec">, L<url>
    if "|" in body:
        return body.split("|", 1)[0]
    m = re.match(r'^(.*?)/"?(.*?)"?$', body)
    if m and not body.startswith("http") and m.group(2):
        return f'"{m.group(2)}" in {m.group(1)}' if m.group(1) else f'"{m.group(2)}"'
    return body


def render_codes(text):
    """Expands POD formatting codes X<...>, X<< ... >>, nested, to plain text."""
    out = []
    i = 0
    n = len(text)
    while i < n:
        m = re.compile(r"([A-Z])(<+)(\s?)").match(text, i)
        if m and (m.group(1) in "BCEFILSXZ"):
            code, opens = m.group(1), len(m.group(2))
            j = m.end()
            if opens == 1:
                depth, k = 1, j
                while k < n and depth:
                    if re.compile(r"[A-Z]<").match(text, k):
                        depth += 1
                        k += 2
                        continue
                    if text[k] == ">":
                        depth -= 1
                    k += 1
                body = text[j:k - 1] if depth == 0 else text[j:]
                end = k
            else:
                close = re.compile(r"\s" + ">" * opens)
                cm = close.search(text, j)
                body = text[j:cm.start()] if cm else text[j:]
                end = cm.end() if cm else n
            inner = render_codes(body)
            if code == "C":
                out.append("`" + inner + "`")
            elif code == "E":
                out.append(ESCAPES.get(inner, chr(int(inner, 0)) if inner[:1].isdigit() else inner))
            elif code == "L":
                out.append(_render_link(inner))
            elif code in "XZ":
                pass
            else:  # B I F S: keep the text
                out.append(inner)
            i = end
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def parse_pod(path):
    """Returns [(question, answer)] of one POD file."""
    with open(path, encoding="utf-8") as f:
        paras = re.split(r"\n[ \t]*\n", f.read())
    items, q, body, skip = [], None, [], False
    for p in paras:
        p = p.rstrip("\n")
        if not p.strip():
            continue
        if p.startswith("="):
            cmd, _, rest = p.partition(" ")
            cmd = cmd.split("\n")[0]
            if cmd in ("=head1", "=head2"):
                if q is not None:
                    items.append((q, "\n\n".join(body).strip()))
                q = render_codes(" ".join(rest.split())) if cmd == "=head2" else None
                body = []
            elif cmd == "=begin":
                skip = True
            elif cmd == "=end":
                skip = False
            elif cmd == "=item" and q is not None and not skip:
                label = render_codes(" ".join(rest.split()))
                body.append(label if label.startswith(("*", "-")) or label[:1].isdigit() else "- " + label)
            continue  # =over =back =for =cut =pod ...
        if q is None or skip:
            continue
        if p[:1] in (" ", "\t"):
            body.append(p)  # verbatim code block
        else:
            body.append(render_codes(" ".join(p.split())))
    if q is not None:
        items.append((q, "\n\n".join(body).strip()))
    return [(q, a) for q, a in items if q and a]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--val", required=True)
    ap.add_argument("pods", nargs="+")
    args = ap.parse_args()
    items, seen = [], set()
    # /usr/share/perl/5.36 and /usr/share/perl/5.36.0 hold the same pages: keep one per name.
    for p in sorted(args.pods, key=lambda s: (os.path.basename(s), s)):
        if os.path.basename(p) in seen:
            continue
        seen.add(os.path.basename(p))
        items += parse_pod(p)
    if not items:
        sys.exit("fetch-data-perlfaq: error: no =head2 questions found")
    counts = {"train": 0, "val": 0}
    with open(args.train + ".tmp", "w", encoding="utf-8") as tr, open(args.val + ".tmp", "w", encoding="utf-8") as va:
        for i, (q, a) in enumerate(items):
            line = json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]},
                              ensure_ascii=False)
            split = "val" if i % 10 == 9 else "train"
            (va if split == "val" else tr).write(line + "\n")
            counts[split] += 1
    os.replace(args.train + ".tmp", args.train)
    os.replace(args.val + ".tmp", args.val)
    print(f"fetch-data-perlfaq: {len(items)} Q/A pairs -> {counts['train']} train ({args.train}), "
          f"{counts['val']} val ({args.val})")


if __name__ == "__main__":
    main()
