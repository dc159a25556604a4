// Segment's trigger language (@segment/destination-subscriptions: parseFql and validate) on the
// cases tests/integration/test_triggers_compat.py sends as JSON on stdin:
// {"triggers": [text, ...], "messages": [...], "pairs": [[trigger index, message index], ...]}.
// Prints one JSON object: "trees", each trigger's parsed tree or {"error": text}, and
// "results", each pair's answer, true or false, or {"error": text} where validate throws.
import { readFileSync } from 'node:fs'
import subscriptions from '@segment/destination-subscriptions'

const { parseFql, validate } = subscriptions

const { triggers, messages, pairs } = JSON.parse(readFileSync(0, 'utf8'))
const trees = triggers.map((text) => {
  const tree = parseFql(text)
  return tree.error ? { error: String(tree.error.message) } : tree
})
const results = pairs.map(([t, m]) => {
  try {
    return validate(trees[t], messages[m])
  } catch (error) {
    return { error: String(error) }
  }
})
process.stdout.write(JSON.stringify({ trees, results }))
