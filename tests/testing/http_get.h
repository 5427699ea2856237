// Reading a daemon's HTTP port from integration tests: the port a daemon
// wrote to its --metrics_port_file, and plain GETs on 127.0.0.1 with
// deadlines. Thread safety: the functions are thread-safe.
#ifndef CHORUS_TESTS_TESTING_HTTP_GET_H_
#define CHORUS_TESTS_TESTING_HTTP_GET_H_

#include <string>

namespace chorus::test {

// The port number in the file at `path`; 0 when it cannot be read.
int ReadPort(const std::string& path);

// The body of GET http://127.0.0.1:`port``path` (10 s to connect and 10 s
// to read); "" when it fails or the answer is not 200.
std::string HttpGet(int port, const std::string& path);

}  // namespace chorus::test

#endif  // CHORUS_TESTS_TESTING_HTTP_GET_H_
