// Error messages about JSON a peer sent, as phrases for answers and logs.
// Pure functions; safe from any thread.
#pragma once

#include <boost/system/error_code.hpp>
#include <cstddef>
#include <string>
#include <string_view>

namespace idem::json_text {

// Why Boost.JSON refused `text` (`error`, from a parse limited to
// `max_depth`), as a phrase that completes "the message is …": "nested
// deeper than 136 levels", or where and how the text breaks the JSON
// grammar, as the canonicalizer finds it ("not valid JSON at byte 61:
// invalid UTF-8 (byte that cannot start a character); send the text as
// UTF-8"). Boost.JSON says neither where nor what ("syntax error").
std::string DescribeJsonError(std::string_view text, boost::system::error_code error,
                              size_t max_depth);

}  // namespace idem::json_text
