// The console's page, embedded at build time from assets/ (embed.cmake).
#pragma once

#include <string_view>

namespace idem::console {

extern const std::string_view kIndexHtml;   // assets/index.html
extern const std::string_view kConsoleJs;   // assets/console.js
extern const std::string_view kConsoleCss;  // assets/console.css

}  // namespace idem::console
