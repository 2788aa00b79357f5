"""A real OTLP/HTTP trace receiver for tests/suite/telemetry.rs: decodes each
POST /v1/traces (application/x-protobuf) with the `opentelemetry-proto` package and
appends every span, as JSON, one a line, to the file named by argv[1]. Prints
"listening <port>" once it is ready."""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

OUT = sys.argv[1]


def value(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        if self.path != "/v1/traces" or self.headers.get("content-type") != "application/x-protobuf":
            self.send_response(415)
            self.end_headers()
            return
        request = ExportTraceServiceRequest.FromString(body)
        with open(OUT, "a", encoding="utf-8") as out:
            for rs in request.resource_spans:
                resource = {kv.key: value(kv.value) for kv in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        record = {
                            "resource": resource,
                            "scope": ss.scope.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex(),
                            "name": span.name,
                            "kind": span.kind,
                            "start_time_unix_nano": span.start_time_unix_nano,
                            "end_time_unix_nano": span.end_time_unix_nano,
                            "attributes": {kv.key: value(kv.value) for kv in span.attributes},
                            "status": MessageToDict(span.status),
                        }
                        out.write(json.dumps(record) + "\n")
                        print(json.dumps(record), file=sys.stderr, flush=True)
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(f"listening {server.server_address[1]}", flush=True)
server.serve_forever()
