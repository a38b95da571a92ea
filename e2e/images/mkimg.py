#!/usr/bin/env python3
"""Write a single-layer container image archive from local files, without a daemon or registry.

The archive is an OCI image layout (oci-layout, index.json, blobs/sha256/...) that also carries
a Docker-style manifest.json, like `docker save` does since Docker 25, so the same file loads with
`ctr -n k8s.io images import`, `kind load image-archive` and `docker load`.

Example:
  mkimg.py --out pause.tar --ref localhost/kubegrace/pause:e2e \\
      --entrypoint /pause --file build/pause:/pause:0755

Several architectures (--arch amd64 --arch arm64, with {arch} in a --file source) make a
multi-platform image: one manifest per architecture under an OCI image index, which index.json
names. ctr and kind pick their platform from it; the Docker-style manifest.json can name one
image only and names the first architecture's.

--base-layer TAR puts an existing uncompressed layer tar (e.g. a Debian root filesystem) under
the layer of --file entries; e2e/kind/node-image uses it for images that need a userland.

Output is deterministic: same inputs, same digests.
"""

import argparse
import hashlib
import io
import json
import os
import sys
import tarfile

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
ARCHES = ("amd64", "arm64")


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def platform(arch: str) -> dict:
    # arm64 images carry the variant the way docker buildx writes them.
    return {"architecture": arch, "os": "linux", **({"variant": "v8"} if arch == "arm64" else {})}


def tar_entry(name: str, size: int = 0, mode: int = 0o644, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.type, info.mtime = size, mode, kind, 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def build_layer(files, dirs) -> bytes:
    """An uncompressed tar with the parent directories, extra directories and files, sorted."""
    entries = {}
    for path, mode in dirs:
        entries[path.strip("/")] = ("dir", mode, None)
    for src, dest, mode in files:
        dest = dest.strip("/")
        parts = dest.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            entries.setdefault("/".join(parts[:i]), ("dir", 0o755, None))
        with open(src, "rb") as f:
            entries[dest] = ("file", mode, f.read())
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(entries):
            kind, mode, data = entries[name]
            if kind == "dir":
                tar.addfile(tar_entry(name + "/", mode=mode, kind=tarfile.DIRTYPE))
            else:
                tar.addfile(tar_entry(name, size=len(data), mode=mode), io.BytesIO(data))
    return buf.getvalue()


def parse_file(spec: str):
    parts = spec.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1].startswith("/"):
        raise argparse.ArgumentTypeError(f"expected SRC:/DEST[:MODE], got {spec!r}")
    mode = int(parts[2], 8) if len(parts) == 3 else 0o755
    return parts[0], parts[1], mode


def parse_dir(spec: str):
    path, _, mode = spec.partition(":")
    if not path.startswith("/"):
        raise argparse.ArgumentTypeError(f"expected /PATH[:MODE], got {spec!r}")
    return path, int(mode, 8) if mode else 0o755


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="archive to write")
    p.add_argument("--ref", required=True, help="fully qualified name, e.g. localhost/kubegrace/sidecar:e2e")
    p.add_argument("--entrypoint", required=True, help="absolute path of the program in the image")
    p.add_argument("--arg", action="append", default=[], help="default argument (Cmd), repeatable")
    p.add_argument("--file", action="append", type=parse_file, default=[], help="SRC:/DEST[:MODE], repeatable")
    p.add_argument("--dir", action="append", type=parse_dir, default=[], help="/PATH[:MODE] empty directory")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE, repeatable")
    p.add_argument("--user", default="65532:65532", help="uid:gid the image runs as (default 65532:65532)")
    p.add_argument("--port", action="append", default=[], help="exposed port, e.g. 8080/tcp")
    p.add_argument("--label", action="append", default=[], help="KEY=VALUE image label, repeatable")
    p.add_argument("--arch", action="append", choices=ARCHES, help="platform (linux/ARCH), repeatable; default amd64")
    p.add_argument("--base-layer", action="append", default=[], help="uncompressed layer tar under ours, repeatable")
    a = p.parse_args()

    name, _, tag = a.ref.rpartition(":")
    if not name or "/" in tag or tag == "latest" or "." not in name.split("/")[0] and name.split("/")[0] != "localhost":
        p.error(f"--ref must be fully qualified with a tag other than latest, got {a.ref!r}")

    def image(arch: str):
        """The blobs of one architecture's image: [(digest, bytes)], manifest last."""
        files = [(src.replace("{arch}", arch), dest, mode) for src, dest, mode in a.file]
        layers = []
        for path in a.base_layer:
            with open(path, "rb") as f:
                layers.append(f.read())
        layers.append(build_layer(files, a.dir))
        layer_digests = [sha256(layer) for layer in layers]
        # A base layer is a distribution's userland, whose tools (iptables) live in sbin too.
        path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" if a.base_layer else "/usr/local/bin:/usr/bin:/bin"
        env = ["PATH=" + path] + a.env
        labels = {"org.opencontainers.image.title": name.rsplit("/", 1)[-1]}
        labels.update(dict(label.split("=", 1) for label in a.label))
        config = {
            **platform(arch),
            "config": {
                "Entrypoint": [a.entrypoint],
                "Cmd": a.arg or None,
                "Env": env,
                "User": a.user,
                "WorkingDir": "/",
                "ExposedPorts": {port if "/" in port else port + "/tcp": {} for port in a.port} or None,
                "Labels": labels,
            },
            "rootfs": {"type": "layers", "diff_ids": layer_digests},
            "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "e2e/images/mkimg.py"}],
            "created": "1970-01-01T00:00:00Z",
        }
        config["config"] = {k: v for k, v in config["config"].items() if v is not None}
        config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
        config_digest = sha256(config_bytes)
        manifest = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": len(config_bytes)},
            "layers": [{"mediaType": OCI_LAYER, "digest": d, "size": len(x)} for d, x in zip(layer_digests, layers)],
        }
        manifest_bytes = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
        layer_blobs = list(zip(layer_digests, layers))
        return layer_blobs + [(config_digest, config_bytes), (sha256(manifest_bytes), manifest_bytes)]

    ref_annotations = {"io.containerd.image.name": a.ref, "org.opencontainers.image.ref.name": tag}
    arches = a.arch or ["amd64"]
    blobs, platforms, first_image = [], [], None
    for arch in arches:
        image_blobs = image(arch)
        first_image = first_image or image_blobs
        blobs += image_blobs
        digest, data = image_blobs[-1]
        platforms.append(
            {
                "mediaType": OCI_MANIFEST,
                "digest": digest,
                "size": len(data),
                "platform": platform(arch),
            }
        )
    if len(arches) == 1:
        # One platform: index.json names the manifest itself, as before multi-arch existed.
        top = dict(platforms[0], annotations=ref_annotations)
    else:
        image_index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": platforms}
        index_bytes = json.dumps(image_index, sort_keys=True, separators=(",", ":")).encode()
        blobs.append((sha256(index_bytes), index_bytes))
        top = {"mediaType": OCI_INDEX, "digest": sha256(index_bytes), "size": len(index_bytes), "annotations": ref_annotations}
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [top]}
    blob = lambda d: "blobs/sha256/" + d.split(":", 1)[1]  # noqa: E731
    first_layers, first_config = [d for d, _ in first_image[:-2]], first_image[-2][0]
    docker_manifest = [{"Config": blob(first_config), "RepoTags": [a.ref], "Layers": [blob(d) for d in first_layers]}]

    tmp = a.out + ".tmp"
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:

        def add(path: str, data: bytes) -> None:
            tar.addfile(tar_entry(path, size=len(data)), io.BytesIO(data))

        tar.addfile(tar_entry("blobs/", mode=0o755, kind=tarfile.DIRTYPE))
        tar.addfile(tar_entry("blobs/sha256/", mode=0o755, kind=tarfile.DIRTYPE))
        written = set()
        for digest, data in blobs:
            if digest not in written:  # the base layers are the same for every architecture
                written.add(digest)
                add(blob(digest), data)
        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", json.dumps(index, sort_keys=True).encode())
        add("manifest.json", json.dumps(docker_manifest).encode())
    os.replace(tmp, a.out)
    print(f"{a.out} {a.ref} {top['digest']} ({','.join(arches)}; {len(first_image[-3][1])} bytes in the {arches[0]} layer)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
