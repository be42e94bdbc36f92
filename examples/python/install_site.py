#!/usr/bin/env python3
"""Install a landfall site from Python, with a NATS client and the .proto files and nothing else.

This is the bus contract of docs/src/clients.md, spoken by a program that shares no code with
landfall:

1. The protobuf classes come from protoc (grpc_tools.protoc) run over bus-schema/proto, into a
   directory the caller chooses (--gen-dir). That happens on the first run, and again whenever
   the .proto files change.
2. ``landfall.v1.InstallSite`` is published with JetStream on ``landfall.cmd.<site>.hub.install_site``,
   carrying the headers every landfall message has: ``Nats-Msg-Id`` (the command id, the dedup
   key), ``Landfall-Type``, ``Landfall-Correlation-Id`` and ``Landfall-Causation-Id`` (both the
   command id: a command is the root of its chain) and a W3C ``traceparent``. The stream's PubAck
   says whether it held that id already (``duplicate``): publishing an id again, within the
   15-minute dedup window, does the install once, and this program then follows that install
   from its start.
3. The install's events are read from the LANDFALL_EVENTS stream by an ephemeral ordered
   consumer filtered to the site (``landfall.evt.<site>.>``: a rejection of the command is
   published in the site's scope too, as ``landfall.evt.<site>.hub.command.rejected``). Only events
   whose ``Landfall-Correlation-Id`` is the command id are kept. Each is decoded by its
   ``Landfall-Type`` header and printed as one line: the type's short name, then the message as
   compact JSON with the .proto field names.

    python install_site.py [--nats-url URL] [--id UUID] [--timeout SECONDS] [--gen-dir DIR] SITE

Standard output has a ``published {...}`` line (the command id, its subject, its sequence in
LANDFALL_COMMANDS and the PubAck's ``duplicate`` flag), then one line per event. What it all
means goes to standard error.

Exit status: 0 installed (a partial success too), 1 the install failed, 2 the command was
rejected, 3 --timeout ran out first (the install goes on), 4 the bus could not be reached,
64 wrong arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib
import importlib.metadata
import json
import os
import re
import secrets
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

import nats
import nats.errors
import nats.js.errors
from google.protobuf import descriptor_pool, json_format, message_factory
from google.protobuf.message import DecodeError
from nats.js.api import DeliverPolicy

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
HERE = Path(__file__).resolve().parent
DEFAULT_PROTO_DIR = HERE.parent.parent / "bus-schema" / "proto"
DEFAULT_GEN_DIR = HERE / "gen"

EVENTS_STREAM = "LANDFALL_EVENTS"
PACKAGE = "landfall.v1"
INSTALL_SITE = f"{PACKAGE}.InstallSite"
SITE_INSTALLED = f"{PACKAGE}.SiteInstalled"
SITE_INSTALL_FAILED = f"{PACKAGE}.SiteInstallFailed"
COMMAND_REJECTED = f"{PACKAGE}.CommandRejected"

# The header names of docs/src/clients.md.
MSG_ID = "Nats-Msg-Id"
TYPE = "Landfall-Type"
CORRELATION_ID = "Landfall-Correlation-Id"
CAUSATION_ID = "Landfall-Causation-Id"
TRACEPARENT = "traceparent"

# A site id is a DNS label, and never the fleet scope.
SITE_ID = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
FLEET = "fleet"

CONNECT_TIMEOUT = 5.0

EXIT_INSTALLED = 0
EXIT_FAILED = 1
EXIT_REJECTED = 2
EXIT_TIMEOUT = 3
EXIT_UNREACHABLE = 4
EXIT_USAGE = 64


class Unreachable(Exception):
    """The bus cannot be used: no server at the URL, or landfall's streams are not there."""


class UsageParser(argparse.ArgumentParser):
    """argparse that exits with 64 on wrong arguments: 2 means the command was rejected."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def site_id(text: str) -> str:
    if not SITE_ID.match(text) or text == FLEET:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a site id: lowercase letters, digits and '-' (1 to 63, "
            f"not starting or ending with '-'), and not {FLEET!r}"
        )
    return text


def command_id(text: str) -> str:
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a UUID") from None


def revision(text: str) -> int:
    n = int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a design revision (0 or more)")
    return n


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = UsageParser(description="Install a landfall site and follow its events until it ends.")
    p.add_argument("site", type=site_id, help="the site to install, e.g. edge-01")
    p.add_argument(
        "--nats-url",
        default=os.environ.get("NATS_URL", DEFAULT_NATS_URL),
        help=f"the NATS server (default: $NATS_URL, else {DEFAULT_NATS_URL})",
    )
    p.add_argument(
        "--id",
        type=command_id,
        help="the command id (a UUID); the same id published again installs once (default: a new UUIDv7)",
    )
    p.add_argument(
        "--revision", type=revision, default=0, help="the design revision to install (default: 0, the latest)"
    )
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for the end (default: 1800)")
    p.add_argument(
        "--gen-dir",
        type=Path,
        default=DEFAULT_GEN_DIR,
        help="where the generated protobuf classes go (default: gen/ beside this script)",
    )
    p.add_argument("--proto-dir", type=Path, default=DEFAULT_PROTO_DIR, help="the .proto include root")
    return p.parse_args(argv)


# --- protobuf classes ----------------------------------------------------------------------------


def proto_files(proto_dir: Path) -> list[Path]:
    files = sorted((proto_dir / "landfall" / "v1").glob("*.proto"))
    if not files:
        raise FileNotFoundError(f"no .proto files under {proto_dir / 'landfall' / 'v1'}")
    return files


def proto_stamp(proto_dir: Path, files: list[Path]) -> str:
    """What the generated code depends on: the .proto files and the protoc that compiles them."""
    h = hashlib.sha256(f"grpcio-tools {importlib.metadata.version('grpcio-tools')}\0".encode())
    for f in files:
        h.update(str(f.relative_to(proto_dir)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def generate(proto_dir: Path, gen_dir: Path) -> None:
    """Runs protoc into gen_dir unless it holds code for these very .proto files already.

    Files land by rename, so a second run at the same time, or a reader, never sees half a file.
    """
    from grpc_tools import protoc

    files = proto_files(proto_dir)
    stamp = proto_stamp(proto_dir, files)
    stamp_file = gen_dir / ".proto-stamp"
    if stamp_file.is_file() and stamp_file.read_text() == stamp:
        return
    gen_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".protoc-", dir=gen_dir))
    try:
        args = ["protoc", f"-I{proto_dir}", f"--python_out={scratch}", *map(str, files)]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {proto_dir} (see above)")
        for out in sorted(scratch.rglob("*.py")):
            dest = gen_dir / out.relative_to(scratch)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(out, dest)
        (scratch / "stamp").write_text(stamp)
        os.replace(scratch / "stamp", stamp_file)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"generated the landfall.v1 classes into {gen_dir}", file=sys.stderr)


def load_classes(gen_dir: Path) -> None:
    """Imports every generated module, so every landfall.v1 type is in the descriptor pool."""
    # The generated modules import each other as `landfall.v1.x_pb2`.
    sys.path.insert(0, str(gen_dir))
    for module in sorted((gen_dir / "landfall" / "v1").glob("*_pb2.py")):
        importlib.import_module(f"landfall.v1.{module.stem}")


def message_class(type_name: str):
    """The generated class of a `Landfall-Type`, or None for a type these .proto files lack."""
    try:
        descriptor = descriptor_pool.Default().FindMessageTypeByName(type_name)
    except KeyError:
        return None
    return message_factory.GetMessageClass(descriptor)


def as_dict(msg) -> dict:
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


def compact(value) -> str:
    return json.dumps(value, separators=(",", ":"))


def short_name(type_name: str) -> str:
    return type_name.rsplit(".", 1)[-1]


# --- the envelope --------------------------------------------------------------------------------


def new_command_id() -> str:
    """A UUIDv7 (time-ordered), as landfall's own clients choose for a new command."""
    millis = time.time_ns() // 1_000_000
    value = (millis & ((1 << 48) - 1)) << 80 | int.from_bytes(secrets.token_bytes(10), "big")
    value = (value & ~(0xF << 76)) | (0x7 << 76)  # version 7
    value = (value & ~(0x3 << 62)) | (0x2 << 62)  # RFC 4122 variant
    return str(uuid.UUID(int=value))


def traceparent(cmd_id: str) -> str:
    """A new W3C trace: its trace id is the command id (as landfall's own clients do), so every
    message the command causes shares one trace; the span id is random."""
    return f"00-{uuid.UUID(cmd_id).hex}-{secrets.token_hex(8)}-01"


def command_headers(cmd_id: str, type_name: str) -> dict[str, str]:
    return {
        MSG_ID: cmd_id,
        TYPE: type_name,
        CORRELATION_ID: cmd_id,
        CAUSATION_ID: cmd_id,
        TRACEPARENT: traceparent(cmd_id),
    }


# --- the bus -------------------------------------------------------------------------------------


async def connect(url: str):
    """Connects, or raises Unreachable naming the URL and the last error the client saw."""
    errors: list[Exception] = []

    async def remember(e: Exception) -> None:
        errors.append(e)

    try:
        return await asyncio.wait_for(
            nats.connect(url, name="landfall-python-example", connect_timeout=2, error_cb=remember),
            CONNECT_TIMEOUT,
        )
    except (asyncio.TimeoutError, OSError, nats.errors.Error) as e:
        cause = errors[-1] if errors else e
        raise Unreachable(
            f"cannot connect to NATS at {url} ({str(cause) or type(cause).__name__}): "
            "is landfall running? Start it with `landfall up`, or pass --nats-url / set NATS_URL"
        ) from None


async def follow(js, site: str, policy: DeliverPolicy):
    """An ephemeral ordered consumer of the site's events, from `policy` on."""
    try:
        return await js.subscribe(
            f"landfall.evt.{site}.>", stream=EVENTS_STREAM, ordered_consumer=True, deliver_policy=policy
        )
    except nats.js.errors.NotFoundError:
        raise Unreachable(f"there is no {EVENTS_STREAM} stream: is landfall running (`landfall up`)?") from None


async def publish(js, subject: str, msg, cmd_id: str):
    type_name = msg.DESCRIPTOR.full_name
    try:
        return await js.publish(subject, msg.SerializeToString(), headers=command_headers(cmd_id, type_name))
    except (nats.js.errors.NoStreamResponseError, nats.errors.NoRespondersError):
        raise Unreachable(f"no stream stores {subject}: is landfall running (`landfall up`)?") from None


# --- the install ---------------------------------------------------------------------------------


def event_line(type_name: str, payload: bytes) -> tuple[str, dict] | None:
    """The line printed for an event, and its fields; None when it cannot be decoded here."""
    cls = message_class(type_name)
    if cls is None:
        print(f"an event of type {type_name!r} is not in these .proto files; skipped", file=sys.stderr)
        return None
    msg = cls()
    try:
        msg.ParseFromString(payload)
    except DecodeError as e:
        print(f"an event of type {type_name} does not decode ({e}); skipped", file=sys.stderr)
        return None
    fields = as_dict(msg)
    return f"{short_name(type_name)} {compact(fields)}", fields


def verdict(type_name: str, fields: dict) -> int | None:
    """The exit status an event ends the install with, or None when it goes on."""
    if type_name == SITE_INSTALLED:
        outcome = fields.get("outcome", "INSTALL_OUTCOME_UNSPECIFIED")
        print(f"installed: {len(fields.get('results', []))} nodes, {outcome}", file=sys.stderr)
        return EXIT_FAILED if outcome == "INSTALL_OUTCOME_FAILURE" else EXIT_INSTALLED
    if type_name == SITE_INSTALL_FAILED:
        print(f"install failed: {fields.get('reason', '')}", file=sys.stderr)
        return EXIT_FAILED
    if type_name == COMMAND_REJECTED:
        code = fields.get("code", "REJECT_CODE_UNSPECIFIED")
        print(f"rejected ({code}): {fields.get('reason', '')}", file=sys.stderr)
        return EXIT_REJECTED
    return None


async def events_until_end(sub, cmd_id: str, deadline: float) -> int:
    """Prints the command's events until one ends it; EXIT_TIMEOUT when the deadline comes first."""
    loop = asyncio.get_running_loop()
    while (left := deadline - loop.time()) > 0:
        try:
            m = await sub.next_msg(timeout=left)
        except nats.errors.TimeoutError:
            break
        headers = m.headers or {}
        if headers.get(CORRELATION_ID) != cmd_id:
            continue
        decoded = event_line(headers.get(TYPE, ""), m.data)
        if decoded is None:
            continue
        line, fields = decoded
        print(line, flush=True)
        if (code := verdict(headers[TYPE], fields)) is not None:
            return code
    return EXIT_TIMEOUT


async def install(args: argparse.Namespace) -> int:
    generate(args.proto_dir, args.gen_dir)
    load_classes(args.gen_dir)
    cmd_id = args.id or new_command_id()
    cmd = message_class(INSTALL_SITE)(site_id=args.site, design_revision=args.revision)
    subject = f"landfall.cmd.{args.site}.hub.install_site"

    nc = await connect(args.nats_url)
    try:
        js = nc.jetstream()
        # Subscribe before publishing, so no event of the install can slip by.
        sub = await follow(js, args.site, DeliverPolicy.NEW)
        ack = await publish(js, subject, cmd, cmd_id)
        duplicate = bool(ack.duplicate)
        published = {"id": cmd_id, "subject": subject, "stream": ack.stream, "seq": ack.seq, "duplicate": duplicate}
        print(f"published {compact(published)}", flush=True)
        if duplicate:
            print(
                f"duplicate: {cmd_id} was published before (seq {ack.seq}), so the install runs once, "
                "from that publish; following it from the start",
                file=sys.stderr,
            )
            await sub.unsubscribe()
            sub = await follow(js, args.site, DeliverPolicy.ALL)
        code = await events_until_end(sub, cmd_id, asyncio.get_running_loop().time() + args.timeout)
        if code == EXIT_TIMEOUT:
            print(f"gave up waiting after {args.timeout:g} s; the install goes on", file=sys.stderr)
        return code
    finally:
        await nc.close()


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        return asyncio.run(install(args))
    except Unreachable as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except KeyboardInterrupt:
        print("interrupted; the install goes on", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
