// Package conffile reads the files an operator names in flags (the
// offerings and instance-type catalogs, PEM certificates, keys and CA
// bundles, the token file, the base cloud-init user data): whole, into
// memory, and only when that is safe.
//
// Invariants callers rely on:
//   - Only a regular file is read (a symbolic link is followed to one). A
//     device such as /dev/zero, a FIFO, a socket or a directory is refused
//     with an error that says what the path is, before a byte is read.
//   - Opening never blocks: a FIFO without a writer is refused, not waited
//     on, so start-up cannot hang on a file.
//   - At most the given cap is read; a larger file is refused (whether its
//     size was known up front or it grew while being read), so no file can
//     make the process allocate more than its cap.
package conffile
