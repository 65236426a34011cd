// kinesalite's sequence-number parser on the engine's own BigInt instead of bignumber.js, for the
// throughput benches (kinesalite-loopback.js --bigintSequences).
//
// Why: kinesalite parses every record's 56-digit sequence number on each GetRecords (to drop records
// past retention) with bignumber.js, a decimal-to-hex conversion in JavaScript. A CPU profile of a plain
// GetRecords loop over 100,000 records (node --cpu-prof) puts about half of kinesalite's GetRecords CPU
// there, and kinesalite's one thread is the ceiling of every consumer in kcl-bench.py: on a slow machine
// it cannot serve twice the Java KCL's rate to anyone. BigInt gives the same result natively.
//
// Only strings of decimal digits take the BigInt path; anything else (what GetShardIterator must refuse)
// goes to the original, so errors stay kinesalite's own. install() compares the two on every shape
// kinesalite writes (versions 0, 1 and 2, edge values) and on random digit strings, and throws on the
// first difference: a bench never runs on a parser that disagrees with kinesalite's.
'use strict'

const POW_2_124 = 1n << 124n
const POW_2_124_NEXT = 1n << 129n
const POW_2_185 = 1n << 185n
const POW_2_185_NEXT = 3n << 184n
const DIGITS = /^[0-9]+$/

function fastParser(original) {
  return function parseSequence(seq) {
    if (typeof seq !== 'string' || !DIGITS.test(seq)) return original(seq)
    let seqNum = BigInt(seq)
    if (seqNum < POW_2_124) seqNum += POW_2_124
    const hex = seqNum.toString(16)
    const version = seqNum < POW_2_124_NEXT ? 0
      : (seqNum > POW_2_185 && seqNum < POW_2_185_NEXT) ? parseInt(hex.slice(hex.length - 1), 16) : null
    if (version == 2) {
      let seqIxHex = hex.slice(11, 27), shardIxHex = hex.slice(38, 46)
      if (parseInt(seqIxHex[0], 16) > 7) throw new Error('Sequence index too high')
      if (parseInt(shardIxHex[0], 16) > 7) shardIxHex = '-' + shardIxHex
      const shardCreateSecs = parseInt(hex.slice(1, 10), 16)
      if (shardCreateSecs >= 16025175000) throw new Error('Date too large: ' + shardCreateSecs)
      return {
        shardCreateTime: shardCreateSecs * 1000,
        seqIx: BigInt('0x' + seqIxHex).toString(),
        byte1: hex.slice(27, 29),
        seqTime: parseInt(hex.slice(29, 38), 16) * 1000,
        shardIx: parseInt(shardIxHex, 16),
        version: version,
      }
    } else if (version == 1) {
      return {
        shardCreateTime: parseInt(hex.slice(1, 10), 16) * 1000,
        byte1: hex.slice(11, 13),
        seqTime: parseInt(hex.slice(13, 22), 16) * 1000,
        seqRand: hex.slice(22, 36),
        seqIx: parseInt(hex.slice(36, 38), 16),
        shardIx: parseInt(hex.slice(38, 46), 16),
        version: version,
      }
    } else if (version === 0) {
      const shardCreateSecs = parseInt(hex.slice(1, 10), 16)
      if (shardCreateSecs >= 16025175000) throw new Error('Date too large: ' + shardCreateSecs)
      return {
        shardCreateTime: shardCreateSecs * 1000,
        byte1: hex.slice(10, 12),
        seqRand: hex.slice(12, 28),
        shardIx: parseInt(hex.slice(28, 32), 16),
        version: version,
      }
    }
    throw new Error('Unknown version: ' + version)
  }
}

// What a call gives: its result or its error's message, so a difference in either shows.
function outcome(parse, seq) {
  try {
    return JSON.stringify(parse(seq))
  } catch (e) {
    return 'error: ' + e.message
  }
}

function samples(db) {
  const out = ['0', '1', '00012', (POW_2_124 - 1n).toString(), POW_2_124.toString(), (POW_2_124_NEXT - 1n).toString(),
    POW_2_124_NEXT.toString(), POW_2_185.toString(), (POW_2_185 + 1n).toString(), (POW_2_185_NEXT - 1n).toString(),
    POW_2_185_NEXT.toString(), '9'.repeat(80)]
  const now = Date.now()
  for (let i = 0; i < 3000; i++) {
    const shardIx = i % 7 == 0 ? 2147483647 - i : i % 50
    const base = { shardCreateTime: now - i * 977000, seqTime: now + i * 13000, shardIx: shardIx,
      byte1: (i % 256).toString(16).padStart(2, '0') }
    out.push(db.stringifySequence(Object.assign({}, base, { seqIx: String(i * 7919) })))
    out.push(db.stringifySequence(Object.assign({}, base, { version: 1, seqIx: i % 256,
      seqRand: (i * 2654435761 % 2 ** 52).toString(16).padStart(14, '0').slice(-14) })))
    out.push(db.stringifySequence(Object.assign({}, base, { version: 0,
      seqRand: (i * 40503).toString(16).padStart(16, '0') })))
    let digits = String(1 + (i % 9))
    for (let n = i % 70; n > 0; n--) digits += String((i * 31 + n * 17) % 10)
    out.push(digits)
  }
  return out
}

// Replaces kinesalite's exported parseSequence (the one getRecords.js and getShardIterator.js call)
// after checking it against the original; returns how many inputs were compared.
function install(db) {
  const original = db.parseSequence
  const fast = fastParser(original)
  const inputs = samples(db)
  for (const seq of inputs) {
    const want = outcome(original, seq), got = outcome(fast, seq)
    if (want !== got) throw new Error(`BigInt parseSequence differs on ${seq}: ${got}, kinesalite: ${want}`)
  }
  db.parseSequence = fast
  return inputs.length
}

module.exports = { install }
