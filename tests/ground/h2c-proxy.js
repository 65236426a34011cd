// Cleartext HTTP/2 (prior knowledge, "h2c") in front of an HTTP/1.1 server, for the Java KCL: its
// Kinesis client is always built for HTTP/2 (KinesisClientUtil), and kinesalite speaks only HTTP/1.1
// ("First received frame was not SETTINGS" without this).
// Usage: node h2c-proxy.js <listen port> <target port>   (both on 127.0.0.1; prints the listen port)
const http = require('http')
const http2 = require('http2')
const [listen, target] = process.argv.slice(2).map(Number)
const hop = new Set(['connection', 'keep-alive', 'transfer-encoding', 'upgrade', 'proxy-connection', 'http2-settings', 'te', 'host'])
const agent = new http.Agent({ keepAlive: true, maxSockets: 64 })
const server = http2.createServer({}, (req, res) => {
  const headers = {}
  for (const [k, v] of Object.entries(req.headers)) if (!k.startsWith(':') && !hop.has(k)) headers[k] = v
  headers.host = `127.0.0.1:${target}`
  const up = http.request({ host: '127.0.0.1', port: target, method: req.method, path: req.url, headers, agent }, (r) => {
    const out = {}
    for (const [k, v] of Object.entries(r.headers)) if (!hop.has(k)) out[k] = v
    res.writeHead(r.statusCode, out)
    r.pipe(res)
  })
  up.on('error', (e) => { res.writeHead(502); res.end(String(e)) })
  req.pipe(up)
})
server.listen(listen, '127.0.0.1', () => console.log(server.address().port))
