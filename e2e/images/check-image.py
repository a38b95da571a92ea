#!/usr/bin/env python3
"""Check a release image archive written by mkimg.py (through e2e/cluster/images).

For each architecture: the OCI index names the image and every platform once; the config
says linux/ARCH, a numeric non-root user, the binary as entrypoint and the OCI labels; the
layer holds the binary and no shell; the binary is a static ELF for ARCH with the revision
baked in. The binary of the machine's own architecture is run with --version.

  check-image.py ARCHIVE --ref REF --binary NAME --version V --revision R --source URL \\
      --license L --arch amd64 --arch arm64
"""

import argparse
import io
import json
import os
import platform
import struct
import subprocess
import sys
import tarfile
import tempfile

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
ELF_MACHINE = {"amd64": 62, "arm64": 183}  # EM_X86_64, EM_AARCH64
HOST_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine())
SHELLS = ("bin/sh", "bin/bash", "bin/ash", "bin/busybox", "usr/bin/sh")
PT_INTERP = 3


class Failed(Exception):
    pass


def expect(cond: bool, what: str) -> None:
    if not cond:
        raise Failed(what)


def elf_facts(data: bytes):
    """(e_machine, has a program interpreter) of a 64-bit little-endian ELF."""
    expect(data[:4] == b"\x7fELF", "binary is not an ELF file")
    expect(data[4] == 2 and data[5] == 1, "binary is not a 64-bit little-endian ELF")
    (machine,) = struct.unpack_from("<H", data, 18)
    (phoff,) = struct.unpack_from("<Q", data, 32)
    phentsize, phnum = struct.unpack_from("<HH", data, 54)
    types = [struct.unpack_from("<I", data, phoff + i * phentsize)[0] for i in range(phnum)]
    return machine, PT_INTERP in types


def check(a) -> list:
    notes = []
    with tarfile.open(a.archive) as tar:

        def read(path: str) -> bytes:
            f = tar.extractfile(path)
            expect(f is not None, f"{path} missing from the archive")
            return f.read()

        def blob(digest: str) -> bytes:
            return read("blobs/sha256/" + digest.split(":", 1)[1])

        expect(json.loads(read("oci-layout")) == {"imageLayoutVersion": "1.0.0"}, "oci-layout")
        top = json.loads(read("index.json"))["manifests"]
        expect(len(top) == 1, f"index.json names {len(top)} images, want 1")
        expect(top[0]["annotations"]["io.containerd.image.name"] == a.ref, f"image name {top[0]['annotations']}")
        expect(top[0]["mediaType"] == OCI_INDEX, "index.json does not name a multi-platform index")
        platforms = json.loads(blob(top[0]["digest"]))["manifests"]
        arches = sorted(m["platform"]["architecture"] for m in platforms)
        expect(arches == sorted(a.arch), f"platforms {arches}, want {sorted(a.arch)}")
        for m in platforms:
            arch = m["platform"]["architecture"]
            expect(m["platform"]["os"] == "linux", f"{arch}: os {m['platform']['os']}")
            manifest = json.loads(blob(m["digest"]))
            config = json.loads(blob(manifest["config"]["digest"]))
            expect(config["architecture"] == arch and config["os"] == "linux", f"{arch}: config platform")
            c = config["config"]
            uid, _, gid = c.get("User", "").partition(":")
            expect(uid.isdigit() and int(uid) != 0 and (not gid or gid.isdigit()), f"{arch}: user {c.get('User')!r}")
            entry = f"/usr/local/bin/{a.binary}"
            expect(c.get("Entrypoint") == [entry], f"{arch}: entrypoint {c.get('Entrypoint')}")
            want_labels = {
                "org.opencontainers.image.source": a.source,
                "org.opencontainers.image.version": a.version,
                "org.opencontainers.image.revision": a.revision,
                "org.opencontainers.image.licenses": a.license,
            }
            for key, want in want_labels.items():
                expect(c.get("Labels", {}).get(key) == want, f"{arch}: label {key}={c.get('Labels', {}).get(key)!r}, want {want!r}")
            expect(len(manifest["layers"]) == 1, f"{arch}: {len(manifest['layers'])} layers")
            with tarfile.open(fileobj=io.BytesIO(blob(manifest["layers"][0]["digest"]))) as layer:
                names = layer.getnames()
                expect(not any(n.strip("/") in SHELLS for n in names), f"{arch}: a shell in the image: {names}")
                f = layer.extractfile(entry.lstrip("/"))
                expect(f is not None, f"{arch}: {entry} missing from the layer")
                exe = f.read()
            machine, dynamic = elf_facts(exe)
            expect(machine == ELF_MACHINE[arch], f"{arch}: ELF machine {machine}, want {ELF_MACHINE[arch]}")
            expect(not dynamic, f"{arch}: the binary is dynamically linked (PT_INTERP)")
            expect(a.revision.encode() in exe, f"{arch}: revision {a.revision} not in the binary")
            want_line = f"{a.binary} {a.version} (revision {a.revision})\n"
            if arch == HOST_ARCH:
                with tempfile.TemporaryDirectory() as tmp:
                    path = os.path.join(tmp, a.binary)
                    with open(path, "wb") as out:
                        out.write(exe)
                    os.chmod(path, 0o755)
                    got = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
                expect(got.returncode == 0 and got.stdout == want_line, f"{arch}: --version said {got.stdout!r} (status {got.returncode}), want {want_line!r}")
                notes.append(f"{arch}: ran --version: {got.stdout.strip()}")
            else:
                notes.append(f"{arch}: static ELF, machine {machine}, revision baked in ({len(exe)} bytes)")
    return notes


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("archive")
    for flag in ("ref", "binary", "version", "revision", "source", "license"):
        p.add_argument("--" + flag, required=True)
    p.add_argument("--arch", action="append", required=True, choices=sorted(ELF_MACHINE))
    a = p.parse_args()
    try:
        notes = check(a)
    except (Failed, KeyError, ValueError, tarfile.TarError) as e:
        print(f"FAIL {a.archive}: {e}", file=sys.stderr)
        return 1
    for note in notes:
        print(f"ok {os.path.basename(a.archive)} {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
