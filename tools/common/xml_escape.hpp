// SPDX-License-Identifier: Apache-2.0
// The command-line tools' SVG writers (memdecay-replay, memdecay-eval, memdecay-calibrate) put names from the
// command line and from data files (policies, tiers, regions, models) into <text> elements and attributes:
// escape the characters XML reserves there.
#ifndef MEMDECAY_TOOLS_XML_ESCAPE_HPP
#define MEMDECAY_TOOLS_XML_ESCAPE_HPP

#include <string>
#include <string_view>

namespace memdecay_tools {

/// `s` with &, <, > and " replaced by their entities (safe in text and in double-quoted attributes).
inline std::string xml_escape(std::string_view s) {
  std::string o;
  o.reserve(s.size());
  for (char ch : s) {
    if (ch == '&')
      o += "&amp;";
    else if (ch == '<')
      o += "&lt;";
    else if (ch == '>')
      o += "&gt;";
    else if (ch == '"')
      o += "&quot;";
    else
      o += ch;
  }
  return o;
}

}  // namespace memdecay_tools

#endif  // MEMDECAY_TOOLS_XML_ESCAPE_HPP
