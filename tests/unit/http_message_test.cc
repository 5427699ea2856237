// The metrics port's HTTP: where a request head ends, what it asks for,
// and the responses it gets.
#include "common/http_message.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

TEST(HttpHeadEndTest, HttpHeadEnd_PartialOrWhole_ZeroOrPastBlankLine) {
  EXPECT_EQ(HttpHeadEnd("GET / HTTP/1.1\r\nHost: a\r\n"), 0u);
  const std::string head = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
  EXPECT_EQ(HttpHeadEnd(head + "body"), head.size());
}

TEST(ParseHttpRequestHeadTest, ParseHttpRequestHead_PathAndQuery_Decoded) {
  absl::StatusOr<HttpRequest> request = ParseHttpRequestHead(
      "GET /status%20page?group=a+b&x=%2F&x=second&flag HTTP/1.1\r\n"
      "Host: h\r\n\r\n");
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->method, "GET");
  EXPECT_EQ(request->path, "/status page");
  EXPECT_EQ(request->params.at("group"), "a b");
  EXPECT_EQ(request->params.at("x"), "/");
  EXPECT_EQ(request->params.at("flag"), "");
}

TEST(ParseHttpRequestHeadTest, ParseHttpRequestHead_Malformed_InvalidArgument) {
  for (const char* head :
       {"GET /\r\n\r\n", "GET metrics HTTP/1.1\r\n\r\n", "GET / SPDY/3\r\n\r\n",
        " / HTTP/1.1\r\n\r\n", "GET /a%2 HTTP/1.1\r\n\r\n",
        "GET /?a=%zz HTTP/1.1\r\n\r\n", "\x16\x03\x01\r\n\r\n"}) {
    SCOPED_TRACE(head);
    EXPECT_TRUE(absl::IsInvalidArgument(ParseHttpRequestHead(head).status()));
  }
}

TEST(FormatHttpResponseTest, FormatHttpResponse_Body_LengthAndClose) {
  const std::string response =
      FormatHttpResponse(404, "text/plain", "no page\n");
  EXPECT_THAT(response, HasSubstr("HTTP/1.1 404 Not Found\r\n"));
  EXPECT_THAT(response, HasSubstr("Content-Length: 8\r\n"));
  EXPECT_THAT(response, HasSubstr("Connection: close\r\n\r\nno page\n"));
}

}  // namespace
}  // namespace chorus
