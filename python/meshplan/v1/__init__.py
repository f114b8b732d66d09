"""meshplan's gRPC contract (package ``meshplan.v1``): generated from ``proto/meshplan/v1/planner.proto``
by ``scripts/gen_proto.py``; do not edit the ``planner_pb2*`` files by hand."""
