// Starts kinesalite bound to 127.0.0.1 only (its own cli.js listens on every interface).
// Usage: node kinesalite-loopback.js <kinesalite module dir> --port N [--bigintSequences] [kinesalite options]
// --bigintSequences: kinesalite's sequence-number parser on BigInt (kinesalite-bigint.js), checked
// against the original at start; the throughput benches use it, the tests run kinesalite as published.
const { createRequire } = require('module')
const path = require('path')
const moduleRequire = createRequire(path.join(process.argv[2], 'index.js'))
const argv = moduleRequire('minimist')(process.argv.slice(3))
if (argv.bigintSequences) {
  const compared = require('./kinesalite-bigint.js').install(moduleRequire('./db/index.js'))
  console.log('kinesalite: sequence numbers parsed with BigInt (same result on %d inputs)', compared)
}
const server = moduleRequire('./index.js')(argv).listen(argv.port, '127.0.0.1', () => {
  const a = server.address()
  console.log('kinesalite listening at http://%s:%s', a.address, a.port)
})
