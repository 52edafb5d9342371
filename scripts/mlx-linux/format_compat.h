// Force-included when building mlx-c on Linux with GCC 12, whose libstdc++ has no <format>.
// mlx-c only uses std::format for error messages with plain "{}" placeholders, so a tiny
// stand-in that substitutes arguments in order is enough.
#pragma once
#ifdef __cplusplus
#if __has_include(<format>)
#include <format>
#else
#include <sstream>
#include <string>
#include <string_view>
namespace std {
inline void perch_format_rest(ostringstream& out, string_view fmt) { out << fmt; }
template <typename T, typename... Rest>
void perch_format_rest(ostringstream& out, string_view fmt, const T& value, const Rest&... rest) {
  auto at = fmt.find("{}");
  if (at == string_view::npos) { out << fmt; return; }
  out << fmt.substr(0, at) << value;
  perch_format_rest(out, fmt.substr(at + 2), rest...);
}
template <typename... Args>
string format(string_view fmt, const Args&... args) {
  ostringstream out;
  perch_format_rest(out, fmt, args...);
  return out.str();
}
}  // namespace std
#endif
#endif
