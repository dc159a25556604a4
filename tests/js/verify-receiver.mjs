// A webhook receiver in Node.js that verifies each request with the published Standard
// Webhooks verifiers, `standardwebhooks` and `svix`, as a receiver built on them would:
// headers as Node's HTTP server reads them (bytes as Latin-1), the body as received.
// Answers 204 when both verify, 401 otherwise; prints one JSON line per request, after a
// first line {"port"}. tests/integration/test_signing.py starts it.
// Usage: node verify-receiver.mjs WHSEC_SECRET   (stops when its stdin closes)
import http from 'node:http'
import { Webhook as StandardWebhook } from 'standardwebhooks'
import { Webhook as SvixWebhook } from 'svix'

const secret = process.argv[2]
const verifiers = {
  standardwebhooks: new StandardWebhook(secret),
  svix: new SvixWebhook(secret),
}

function verdict(verifier, body, headers) {
  try {
    verifier.verify(body, headers)
    return 'ok'
  } catch (error) {
    return String(error?.message ?? error)
  }
}

const server = http.createServer((request, response) => {
  const chunks = []
  request.on('data', (chunk) => chunks.push(chunk))
  request.on('end', () => {
    const body = Buffer.concat(chunks).toString('utf8')
    const report = { webhookId: request.headers['webhook-id'] ?? null }
    for (const [name, verifier] of Object.entries(verifiers)) {
      report[name] = verdict(verifier, body, request.headers)
    }
    try {
      report.messageId = JSON.parse(body).messageId ?? null
    } catch {
      report.messageId = null
    }
    const ok = Object.keys(verifiers).every((name) => report[name] === 'ok')
    response.writeHead(ok ? 204 : 401).end()
    process.stdout.write(JSON.stringify(report) + '\n')
  })
})

server.listen(0, '127.0.0.1', () => {
  process.stdout.write(JSON.stringify({ port: server.address().port }) + '\n')
})
process.stdin.on('end', () => server.close(() => process.exit(0)))
process.stdin.resume()
