#!/usr/bin/env python3
"""OCI image archives without a container daemon, and a check that one agrees with a Dockerfile.

  oci-image.py build --out A.tar --name REF [--user U] [--entrypoint PATH] --file SRC:DEST:MODE ...
      One layer holding the files (owned by root, mtime 0), a config, a manifest and an index: the
      layout `ctr images import` loads. The same inputs give the same bytes (same digests).
  oci-image.py check --dockerfile F --archive A.tar
      The final stage of F (FROM scratch, COPY, USER, ENTRYPOINT) against the archive's config and
      files: exit 1 and name every difference.
"""
import argparse
import gzip
import hashlib
import io
import json
import shlex
import sys
import tarfile

# What Docker gives an image built FROM scratch.
DEFAULT_ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def tar_add(tar, name, data=None, mode=0o755, directory=False):
    info = tarfile.TarInfo(name)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = mode
    if directory:
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    else:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def layer(files):
    """The layer tar (uncompressed) of [(dest, bytes, mode)], parent directories first."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        seen = set()
        for dest, data, mode in sorted(files):
            parts = dest.strip("/").split("/")
            for i in range(1, len(parts)):
                d = "/".join(parts[:i]) + "/"
                if d not in seen:
                    seen.add(d)
                    tar_add(tar, d, directory=True)
            tar_add(tar, "/".join(parts), data, mode)
    return out.getvalue()


def build(args):
    files = []
    for spec in args.file:
        src, dest, mode = spec.split(":")
        with open(src, "rb") as f:
            files.append((dest, f.read(), int(mode, 8)))
    raw = layer(files)
    gz = io.BytesIO()
    with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0, compresslevel=6) as g:
        g.write(raw)
    blob = gz.getvalue()
    config = {"Env": DEFAULT_ENV}
    if args.user:
        config["User"] = args.user
    if args.entrypoint:
        config["Entrypoint"] = [args.entrypoint]
    config_json = json.dumps({
        "architecture": "amd64", "os": "linux", "created": "1970-01-01T00:00:00Z", "config": config,
        "rootfs": {"type": "layers", "diff_ids": [sha256(raw)]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "tests/ground/oci-image.py"}],
    }, sort_keys=True).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": sha256(config_json), "size": len(config_json)},
        "layers": [{"mediaType": LAYER_TYPE, "digest": sha256(blob), "size": len(blob)}],
    }, sort_keys=True).encode()
    tag = args.name.rsplit(":", 1)[1] if ":" in args.name.rsplit("/", 1)[-1] else "latest"
    index = json.dumps({
        "schemaVersion": 2, "mediaType": INDEX_TYPE,
        "manifests": [{"mediaType": MANIFEST_TYPE, "digest": sha256(manifest), "size": len(manifest),
                       "platform": {"architecture": "amd64", "os": "linux"},
                       "annotations": {"io.containerd.image.name": args.name,
                                       "org.opencontainers.image.ref.name": tag}}],
    }, sort_keys=True).encode()
    with tarfile.open(args.out, "w", format=tarfile.PAX_FORMAT) as tar:
        tar_add(tar, "blobs/", directory=True)
        tar_add(tar, "blobs/sha256/", directory=True)
        for data in (blob, config_json, manifest):
            tar_add(tar, "blobs/sha256/" + sha256(data)[7:], data, 0o644)
        tar_add(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode(), 0o644)
        tar_add(tar, "index.json", index, 0o644)
    print(json.dumps({"name": args.name, "archive_bytes": len(open(args.out, "rb").read()),
                      "layer_bytes": len(raw), "layer_gzip_bytes": len(blob), "manifest": sha256(manifest)}))


def read_archive(path):
    """(config dict, {path: (mode, bytes)}) of the single image in an OCI archive."""
    with tarfile.open(path) as tar:
        def blob(digest):
            return tar.extractfile("blobs/sha256/" + digest.split(":", 1)[1]).read()
        index = json.loads(tar.extractfile("index.json").read())
        manifest = json.loads(blob(index["manifests"][0]["digest"]))
        config = json.loads(blob(manifest["config"]["digest"]))
        files = {}
        for entry in manifest["layers"]:
            data = blob(entry["digest"])
            if entry["mediaType"].endswith("+gzip"):
                data = gzip.decompress(data)
            with tarfile.open(fileobj=io.BytesIO(data)) as layer_tar:
                for m in layer_tar.getmembers():
                    if m.isfile():
                        files["/" + m.name.lstrip("/")] = (m.mode, m.uid, m.gid, layer_tar.extractfile(m).read())
        return config, files


def final_stage(dockerfile):
    """FROM, COPY destinations, USER and ENTRYPOINT of the last stage of a Dockerfile."""
    lines, current = [], ""
    for raw in open(dockerfile):
        line = raw.rstrip("\n")
        if line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        if current.strip():
            lines.append(current.strip())
        current = ""
    stage = {"from": None, "copies": [], "user": None, "entrypoint": None}
    for line in lines:
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            stage = {"from": rest.split()[0], "copies": [], "user": None, "entrypoint": None}
        elif word == "COPY":
            parts = [p for p in shlex.split(rest) if not p.startswith("--")]
            stage["copies"].append(parts[-1])
        elif word == "USER":
            stage["user"] = rest.strip()
        elif word == "ENTRYPOINT":
            stage["entrypoint"] = json.loads(rest)
    return stage


def has_interpreter(elf):
    """True when a 64-bit little-endian ELF asks for a dynamic loader (a PT_INTERP program header)."""
    phoff = int.from_bytes(elf[0x20:0x28], "little")
    phentsize = int.from_bytes(elf[0x36:0x38], "little")
    phnum = int.from_bytes(elf[0x38:0x3A], "little")
    for i in range(phnum):
        start = phoff + i * phentsize
        if int.from_bytes(elf[start:start + 4], "little") == 3:
            return True
    return False


def check(args):
    stage = final_stage(args.dockerfile)
    config, files = read_archive(args.archive)
    c = config.get("config", {})
    problems = []
    if stage["from"] != "scratch":
        problems.append(f"{args.dockerfile}: the final stage is FROM {stage['from']}, not scratch")
    if c.get("User") != stage["user"]:
        problems.append(f"user: image {c.get('User')!r}, Dockerfile {stage['user']!r}")
    if c.get("Entrypoint") != stage["entrypoint"]:
        problems.append(f"entrypoint: image {c.get('Entrypoint')!r}, Dockerfile {stage['entrypoint']!r}")
    if sorted(files) != sorted(stage["copies"]):
        problems.append(f"files: image {sorted(files)}, Dockerfile copies {sorted(stage['copies'])}")
    for path, (mode, uid, gid, data) in files.items():
        if uid != 0 or gid != 0:
            problems.append(f"{path}: owned by {uid}:{gid}, COPY gives root")
    entry = (stage["entrypoint"] or [""])[0]
    if entry in files:
        mode, _, _, data = files[entry]
        if not mode & 0o001 or not mode & 0o100:
            problems.append(f"{entry}: mode {oct(mode)} is not executable by user {stage['user']}")
        if not data.startswith(b"\x7fELF"):
            problems.append(f"{entry}: not an ELF executable")
        elif has_interpreter(data):
            problems.append(f"{entry}: dynamically linked (needs a loader scratch does not have)")
    ca = "/etc/ssl/certs/ca-certificates.crt"
    if ca in files and b"BEGIN CERTIFICATE" not in files[ca][3]:
        problems.append(f"{ca}: no certificates in it")
    if config.get("os") != "linux" or config.get("architecture") != "amd64":
        problems.append(f"platform {config.get('os')}/{config.get('architecture')}, expected linux/amd64")
    for p in problems:
        print(f"{args.archive}: {p}", file=sys.stderr)
    if not problems:
        print(f"{args.archive} agrees with {args.dockerfile}: FROM scratch, files {sorted(files)}, "
              f"user {c.get('User')}, entrypoint {c.get('Entrypoint')}")
    return 1 if problems else 0


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", required=True)
    b.add_argument("--name", required=True)
    b.add_argument("--user")
    b.add_argument("--entrypoint")
    b.add_argument("--file", action="append", required=True, help="SRC:DEST:MODE (octal)")
    c = sub.add_parser("check")
    c.add_argument("--dockerfile", required=True)
    c.add_argument("--archive", required=True)
    args = parser.parse_args()
    if args.command == "build":
        build(args)
        return 0
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
