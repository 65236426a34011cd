// Starts kinesalite bound to 127.0.0.1 only (its own cli.js listens on every interface).
// Usage: node kinesalite-loopback.js <kinesalite module dir> --port N [kinesalite options]
const { createRequire } = require('module')
const path = require('path')
const moduleRequire = createRequire(path.join(process.argv[2], 'index.js'))
const argv = moduleRequire('minimist')(process.argv.slice(3))
const server = moduleRequire('./index.js')(argv).listen(argv.port, '127.0.0.1', () => {
  const a = server.address()
  console.log('kinesalite listening at http://%s:%s', a.address, a.port)
})
