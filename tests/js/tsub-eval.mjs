// Segment's filter runtime (@segment/tsub) on the cases tests/integration/test_filters_tsub.py
// sends as JSON on stdin: {"messages": [...], "cases": [[ir, message index], ...]}.
// Prints one JSON array: each case's result, true or false, or {"error": text} where tsub throws.
import { readFileSync } from 'node:fs'
import tsub from '@segment/tsub'

const { matches } = tsub
const { messages, cases } = JSON.parse(readFileSync(0, 'utf8'))
const results = cases.map(([ir, index]) => {
  try {
    return matches(messages[index], { type: 'fql', ir: JSON.stringify(ir) })
  } catch (error) {
    return { error: String(error) }
  }
})
process.stdout.write(JSON.stringify(results))
