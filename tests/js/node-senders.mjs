// Sends COUNT track events to efd with one of the Node.js libraries, then flushes and
// prints the messageIds it sent; tests/test_node_libraries.py checks what arrived.
// Usage: node node-senders.mjs segment|rudderstack HOST WRITE_KEY COUNT
import { createRequire } from 'node:module'

const require = createRequire(import.meta.url)
const [library, host, writeKey, countText] = process.argv.slice(2)
const count = Number(countText)
const errors = []
const sent = []

function event(i) {
  const messageId = `${library}-${i}`
  sent.push(messageId)
  return { userId: `user-${i % 7}`, event: 'Order Completed', properties: { i }, messageId }
}

if (library === 'segment') {
  const { Analytics } = require('@segment/analytics-node')
  const analytics = new Analytics({ writeKey, host, flushAt: 20, maxRetries: 3 })
  analytics.on('error', (error) => errors.push(String(error?.reason ?? error)))
  for (let i = 0; i < count; i++) analytics.track(event(i))
  await analytics.closeAndFlush({ timeout: 30000 })
} else if (library === 'rudderstack') {
  const Analytics = require('@rudderstack/rudder-sdk-node')
  const client = new Analytics(writeKey, {
    dataPlaneUrl: host,
    gzip: true,
    flushAt: 20,
    flushInterval: 200,
    logLevel: 'error',
    errorHandler: (error) => errors.push(String(error)),
  })
  const delivered = []
  for (let i = 0; i < count; i++) {
    delivered.push(
      new Promise((resolve) =>
        client.track(event(i), (error) => {
          if (error) errors.push(String(error))
          resolve()
        }),
      ),
    )
  }
  client.flush() // the last, partial batch; the flush timer would send it too
  await Promise.all(delivered)
} else {
  errors.push(`unknown library ${library}`)
}
console.log(JSON.stringify({ sent, errors }))
// rudder-sdk-node keeps a flush timer: leave without waiting for it.
process.exit(errors.length ? 1 : 0)
