#include "tests/testing/http_get.h"

#include <fstream>

#include "httplib.h"

namespace chorus::test {

int ReadPort(const std::string& path) {
  std::ifstream in(path);
  int port = 0;
  in >> port;
  return port;
}

std::string HttpGet(int port, const std::string& path) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(10);
  client.set_read_timeout(10);
  httplib::Result result = client.Get(path.c_str());
  if (!result || result->status != 200) return "";
  return result->body;
}

}  // namespace chorus::test
