# A grpcio (gRPC C-core) client of the agent, for test/cell-agent/rls/lean-server.test.ts: reads
# {"target": ..., "calls": [{"method": "/pkg.Svc/M", "request": HEX, "timeout": S,
# "stream": bool}]} on stdin and prints, per call, {"code": N, "details": str, "responses": [HEX]}
# as one JSON line. Messages go as raw bytes (grpcio's generic channel.unary_unary with identity
# serializers): the test encodes and decodes them with the agent's own codec, so no stubs are needed.
import json
import sys

import grpc


def identity(b):
    return b


def main():
    job = json.load(sys.stdin)
    out = []
    with grpc.insecure_channel(job["target"]) as channel:
        for call in job["calls"]:
            request = bytes.fromhex(call["request"])
            timeout = call.get("timeout", 5)
            try:
                if call.get("stream"):
                    rpc = channel.unary_stream(call["method"], request_serializer=identity, response_deserializer=identity)
                    responses = []
                    for message in rpc(request, timeout=timeout):
                        responses.append(message.hex())
                        if len(responses) >= call.get("take", 1):
                            break
                    out.append({"code": 0, "details": "", "responses": responses})
                else:
                    rpc = channel.unary_unary(call["method"], request_serializer=identity, response_deserializer=identity)
                    response = rpc(request, timeout=timeout)
                    out.append({"code": 0, "details": "", "responses": [response.hex()]})
            except grpc.RpcError as error:
                out.append({"code": error.code().value[0], "details": error.details() or "", "responses": []})
    print(json.dumps(out))


main()
