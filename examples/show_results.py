"""Print each result line of a `quern run` output file as `custom_id: text` (or its error)."""

import json
import sys

for raw in open(sys.argv[1], encoding="utf-8"):
    row = json.loads(raw)
    if row["error"]:
        print(f"{row['custom_id']}: ERROR {row['error']['code']}: {row['error']['message']}")
        continue
    for choice in row["response"]["body"]["choices"]:
        text = choice["message"]["content"] if "message" in choice else choice["text"]
        print(f"{row['custom_id']}[{choice['index']}]: {text.strip()}")
