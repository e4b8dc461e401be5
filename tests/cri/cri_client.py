#!/usr/bin/python3
"""A minimal CRI (runtime.v1) client for devgate's tests: the calls kubelet makes to start a
container, over the runtime's gRPC socket.

grpcio (Debian: python3-grpcio) carries the bytes; the few protobuf messages are encoded
and decoded here by field number (k8s.io/cri-api pkg/apis/runtime/v1/api.proto), so no
generated code and no protoc are needed.

usage: cri_client.py SOCKET METHOD JSON
prints one JSON object: the decoded response, or {"error": {"code": ..., "details": ...}}
(exit status 1).
"""

import json
import sys

import grpc

# ---- protobuf wire format ------------------------------------------------------------


def varint(n):
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_varint(num, n):
    return varint(num << 3) + varint(n) if n else b""


def field_bytes(num, b):
    if isinstance(b, str):
        b = b.encode()
    return varint((num << 3) | 2) + varint(len(b)) + b


def field_str(num, s):
    return field_bytes(num, s) if s else b""


def field_msg(num, m):
    return field_bytes(num, m)


def field_map(num, d):
    return b"".join(field_msg(num, field_str(1, k) + field_str(2, v)) for k, v in sorted(d.items()))


def decode(buf):
    """field number -> list of raw values (int for varints, bytes for length-delimited)."""
    out = {}
    i = 0
    while i < len(buf):
        key, i = read_varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = read_varint(buf, i)
        elif wt == 2:
            n, i = read_varint(buf, i)
            v, i = buf[i : i + n], i + n
        elif wt == 1:
            v, i = buf[i : i + 8], i + 8
        elif wt == 5:
            v, i = buf[i : i + 4], i + 4
        else:
            raise ValueError("unsupported wire type %d" % wt)
        out.setdefault(num, []).append(v)
    return out


def read_varint(buf, i):
    shift = n = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def one(d, num, default=b""):
    return d.get(num, [default])[-1]


def s(d, num):
    return one(d, num).decode()


def signed32(n):
    n &= (1 << 64) - 1
    if n >= 1 << 63:
        n -= 1 << 64
    return n


# ---- CRI messages ----------------------------------------------------------------------

NAMESPACE_MODE = {"POD": 0, "CONTAINER": 1, "NODE": 2}


def pod_sandbox_config(p):
    metadata = (
        field_str(1, p["name"]) + field_str(2, p["uid"]) + field_str(3, p["namespace"])
        + field_varint(4, p.get("attempt", 0))
    )
    ns = field_varint(1, NAMESPACE_MODE[p.get("network", "NODE")])
    security = field_msg(1, ns)
    linux = field_str(1, p.get("cgroup_parent", "")) + field_msg(2, security)
    return (
        field_msg(1, metadata)
        + field_str(2, p.get("hostname", ""))
        + field_str(3, p.get("log_directory", ""))
        + field_map(6, p.get("labels", {}))
        + field_map(7, p.get("annotations", {}))
        + field_msg(8, linux)
    )


def container_config(c):
    metadata = field_str(1, c["name"]) + field_varint(2, c.get("attempt", 0))
    out = field_msg(1, metadata) + field_msg(2, field_str(1, c["image"]))
    out += b"".join(field_str(3, a) for a in c.get("command", []))
    out += b"".join(field_str(4, a) for a in c.get("args", []))
    for m in c.get("mounts", []):
        out += field_msg(
            7,
            field_str(1, m["container_path"]) + field_str(2, m["host_path"])
            + field_varint(3, 1 if m.get("readonly") else 0),
        )
    for d in c.get("devices", []):
        out += field_msg(
            8,
            field_str(1, d["container_path"]) + field_str(2, d["host_path"])
            + field_str(3, d.get("permissions", "rwm")),
        )
    out += field_map(9, c.get("labels", {}))
    out += field_map(10, c.get("annotations", {}))
    out += field_str(11, c.get("log_path", ""))
    out += field_msg(15, b"")
    return out


def req_version(a):
    return field_str(1, "v1")


def resp_version(d):
    return {"version": s(d, 1), "runtime_name": s(d, 2), "runtime_version": s(d, 3),
            "runtime_api_version": s(d, 4)}


def req_run_pod_sandbox(a):
    return field_msg(1, pod_sandbox_config(a["config"])) + field_str(2, a.get("runtime_handler", ""))


def resp_run_pod_sandbox(d):
    return {"pod_sandbox_id": s(d, 1)}


def req_create_container(a):
    return (
        field_str(1, a["pod_sandbox_id"])
        + field_msg(2, container_config(a["config"]))
        + field_msg(3, pod_sandbox_config(a["sandbox_config"]))
    )


def resp_create_container(d):
    return {"container_id": s(d, 1)}


def req_container_id(a):
    return field_str(1, a["container_id"])


def req_pod_sandbox_id(a):
    return field_str(1, a["pod_sandbox_id"])


def resp_empty(d):
    return {}


STATES = {0: "CONTAINER_CREATED", 1: "CONTAINER_RUNNING", 2: "CONTAINER_EXITED", 3: "CONTAINER_UNKNOWN"}


def resp_container_status(d):
    st = decode(one(d, 1))
    mounts = []
    for m in st.get(14, []):
        md = decode(m)
        mounts.append({"container_path": s(md, 1), "host_path": s(md, 2)})
    return {
        "id": s(st, 1),
        "state": STATES.get(one(st, 3, 0), "?"),
        "started_at": one(st, 5, 0),
        "finished_at": one(st, 6, 0),
        "exit_code": signed32(one(st, 7, 0)),
        "reason": s(st, 10),
        "message": s(st, 11),
        "mounts": mounts,
        "log_path": s(st, 15),
    }


METHODS = {
    "Version": (req_version, resp_version),
    "RunPodSandbox": (req_run_pod_sandbox, resp_run_pod_sandbox),
    "StopPodSandbox": (req_pod_sandbox_id, resp_empty),
    "RemovePodSandbox": (req_pod_sandbox_id, resp_empty),
    "CreateContainer": (req_create_container, resp_create_container),
    "StartContainer": (req_container_id, resp_empty),
    "StopContainer": (req_container_id, resp_empty),
    "RemoveContainer": (req_container_id, resp_empty),
    "ContainerStatus": (req_container_id, resp_container_status),
}


def main():
    if len(sys.argv) != 4 or sys.argv[2] not in METHODS:
        print("usage: cri_client.py SOCKET METHOD JSON; METHOD one of " + ", ".join(METHODS),
              file=sys.stderr)
        return 2
    sock, method, arg = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    encode, parse = METHODS[method]
    with grpc.insecure_channel("unix://" + sock) as ch:
        call = ch.unary_unary("/runtime.v1.RuntimeService/" + method)
        try:
            raw = call(encode(arg), timeout=60)
        except grpc.RpcError as e:
            print(json.dumps({"error": {"code": e.code().name, "details": e.details()}}))
            return 1
    print(json.dumps(parse(decode(raw))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
