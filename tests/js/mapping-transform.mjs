// Segment's mapping kit (@segment/actions-core's transform) on the cases
// tests/integration/test_mapping_compat.py sends as JSON on stdin: [[mapping, payload], ...].
// Prints one JSON array: each case's {"value": result}, {"undefined": true} when the result
// is undefined, or {"error": text} where the kit throws.
import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'

// The package's ESM build imports files without extensions, which node refuses: its CJS one.
const { transform } = createRequire(import.meta.url)('@segment/actions-core/mapping-kit')

const cases = JSON.parse(readFileSync(0, 'utf8'))
const results = cases.map(([mapping, payload]) => {
  try {
    const value = transform(mapping, payload)
    return value === undefined ? { undefined: true } : { value }
  } catch (error) {
    return { error: String(error) }
  }
})
process.stdout.write(JSON.stringify(results))
