// Preloaded (`node -r`) into kinesis-mock's main.js, which listens on 0.0.0.0 with no host setting:
// every server it opens listens on 127.0.0.1 instead, and the process exits if one ends up elsewhere,
// so the emulator is never reachable from outside this machine.
const net = require('net')
const LOOPBACK = '127.0.0.1'
const listen = net.Server.prototype.listen
net.Server.prototype.listen = function (...args) {
  if (args[0] !== null && typeof args[0] === 'object' && !Array.isArray(args[0])) {
    if (args[0].path === undefined && args[0].handle === undefined && args[0].fd === undefined) {
      args[0] = { ...args[0], host: LOOPBACK, ipv6Only: false }
    }
  } else if (typeof args[0] === 'number' || (typeof args[0] === 'string' && /^\d+$/.test(args[0]))) {
    // listen(port[, host][, backlog][, callback]): drop a given host, put ours in its place.
    const rest = args.slice(1)
    if (typeof rest[0] === 'string') rest.shift()
    args = [args[0], LOOPBACK, ...rest]
  }
  this.once('listening', () => {
    const address = this.address()
    if (address === null || typeof address !== 'object' || address.address !== LOOPBACK) {
      console.error('kinesis-mock-loopback: a server listens on %j, not %s; exiting', address, LOOPBACK)
      process.exit(1)
    }
    console.error('kinesis-mock-loopback: listening on %s:%d', address.address, address.port)
  })
  return listen.apply(this, args)
}
