// Package bigfleetv1alpha1 is the BigFleet CapacityProvider wire contract,
// protobuf package bigfleet.v1alpha1: the CapacityProvider gRPC service, its
// six RPCs (Create, Configure, Drain, Delete, Get, List), their messages and
// the MachineState and CapacityType enums.
//
// provider.proto is the source of truth and is written from the published
// contract. provider.pb.go and provider_grpc.pb.go are generated from it by
// `make proto` (scripts/proto.sh, with a pinned protoc and pinned plugins)
// and committed; never edit them by hand.
//
// Invariants:
//   - Package, service, message and field names, field numbers and field
//     types match the published contract exactly. BigFleet shards dial this
//     service, so a drift breaks them on the wire (numbers, types) or over
//     reflection and JSON (names). schema_test.go pins every one of them.
//   - Retired fields are never reused: their numbers and old names are
//     reserved.
//   - Regenerating with the pinned toolchain reproduces the committed files
//     byte for byte.
package bigfleetv1alpha1
