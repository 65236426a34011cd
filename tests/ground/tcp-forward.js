// Relays TCP from ADDRESS:PORT to 127.0.0.1:PORT for each PORT given, so the real node's pods reach the
// control plane and the emulators, which listen on loopback only. ADDRESS is the host end of the node's
// veth pair (tests/ground/node.sh), never the machine's external interface.
//   node tcp-forward.js ADDRESS PORT...
const net = require("net");
const [address, ...ports] = process.argv.slice(2);
if (!address || ports.length === 0) {
  console.error("usage: node tcp-forward.js ADDRESS PORT...");
  process.exit(2);
}
for (const port of ports.map(Number)) {
  const server = net.createServer((inbound) => {
    const outbound = net.connect(port, "127.0.0.1");
    inbound.setNoDelay(true);
    outbound.setNoDelay(true);
    inbound.pipe(outbound);
    outbound.pipe(inbound);
    const close = () => { inbound.destroy(); outbound.destroy(); };
    inbound.on("error", close);
    outbound.on("error", close);
    inbound.on("close", close);
    outbound.on("close", close);
  });
  server.on("error", (e) => { console.error(`listen ${address}:${port}: ${e.message}`); process.exit(1); });
  server.listen(port, address, () => console.log(`forwarding ${address}:${port} -> 127.0.0.1:${port}`));
}
