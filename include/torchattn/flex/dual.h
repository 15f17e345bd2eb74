#pragma once

// Dual numbers: a value and its derivative with respect to the score, so that
// flex_attention's backward runs a user's score_mod once per score and gets both
// score_mod(s) and its derivative d score_mod / d s (forward-mode differentiation).
// score_mod, generic in its score's type, sees a Dual<T> there: arithmetic with Duals,
// ints and floats, comparisons by value, and the functions below, called unqualified
// (`using std::tanh; tanh(x)`: std::tanh itself takes no Dual). A cast of the score to
// a number would drop its derivative: it does not compile.

#include <cmath>
#include <type_traits>

namespace torchattn::flex {

template <class T>
struct Dual {
  T v = 0;  // the value
  T d = 0;  // its derivative with respect to the score

  constexpr Dual() = default;
  constexpr Dual(T value, T derivative) : v(value), d(derivative) {}
  /// A constant: any arithmetic value (derivative 0).
  template <class U>
    requires std::is_arithmetic_v<U>
  constexpr Dual(U value) : v(static_cast<T>(value)) {}  // NOLINT(google-explicit-constructor)
  /// No cast to a number: in a score_mod's hands it would drop the derivative, and the
  /// backward's gradients would be wrong with a right forward. A compile error instead.
  template <class U>
    requires std::is_arithmetic_v<U>
  explicit constexpr operator U() const {
    static_assert(sizeof(U) == 0,
                  "flex::Dual: a score_mod cannot cast its score to a number (static_cast<float>(score), "
                  "double(score), (float)score): the cast drops the derivative that flex_attention's backward "
                  "needs. Keep the score's own type: compute on `score` itself (score * 0.5, score + bias) and call "
                  "math functions unqualified (using std::tanh; tanh(score))");
    return U{};
  }
};

template <class T>
constexpr Dual<T> operator+(Dual<T> a, Dual<T> b) {
  return {a.v + b.v, a.d + b.d};
}
template <class T>
constexpr Dual<T> operator-(Dual<T> a, Dual<T> b) {
  return {a.v - b.v, a.d - b.d};
}
template <class T>
constexpr Dual<T> operator-(Dual<T> a) {
  return {-a.v, -a.d};
}
template <class T>
constexpr Dual<T> operator*(Dual<T> a, Dual<T> b) {
  return {a.v * b.v, a.d * b.v + a.v * b.d};
}
template <class T>
constexpr Dual<T> operator/(Dual<T> a, Dual<T> b) {
  return {a.v / b.v, (a.d * b.v - a.v * b.d) / (b.v * b.v)};
}
// With a plain number on either side.
#define TORCHATTN_DUAL_MIXED(op)                  \
  template <class T, class U>                     \
    requires std::is_arithmetic_v<U>              \
  constexpr Dual<T> operator op(Dual<T> a, U b) { \
    return a op Dual<T>(b);                       \
  }                                               \
  template <class T, class U>                     \
    requires std::is_arithmetic_v<U>              \
  constexpr Dual<T> operator op(U a, Dual<T> b) { \
    return Dual<T>(a) op b;                       \
  }
TORCHATTN_DUAL_MIXED(+)
TORCHATTN_DUAL_MIXED(-)
TORCHATTN_DUAL_MIXED(*)
TORCHATTN_DUAL_MIXED(/)
#undef TORCHATTN_DUAL_MIXED

template <class T>
constexpr bool operator<(Dual<T> a, Dual<T> b) {
  return a.v < b.v;
}
template <class T>
constexpr bool operator>(Dual<T> a, Dual<T> b) {
  return a.v > b.v;
}
template <class T>
constexpr bool operator<=(Dual<T> a, Dual<T> b) {
  return a.v <= b.v;
}
template <class T>
constexpr bool operator>=(Dual<T> a, Dual<T> b) {
  return a.v >= b.v;
}
template <class T>
constexpr bool operator==(Dual<T> a, Dual<T> b) {
  return a.v == b.v;
}

template <class T>
Dual<T> tanh(Dual<T> a) {
  const T t = std::tanh(a.v);
  return {t, a.d * (T(1) - t * t)};
}
template <class T>
Dual<T> exp(Dual<T> a) {
  const T e = std::exp(a.v);
  return {e, a.d * e};
}
template <class T>
Dual<T> log(Dual<T> a) {
  return {std::log(a.v), a.d / a.v};
}
template <class T>
Dual<T> sqrt(Dual<T> a) {
  const T r = std::sqrt(a.v);
  return {r, a.d / (T(2) * r)};
}
template <class T>
Dual<T> abs(Dual<T> a) {
  return {std::abs(a.v), a.v < T(0) ? -a.d : a.d};
}
template <class T>
Dual<T> sin(Dual<T> a) {
  return {std::sin(a.v), a.d * std::cos(a.v)};
}
template <class T>
Dual<T> cos(Dual<T> a) {
  return {std::cos(a.v), -a.d * std::sin(a.v)};
}

}  // namespace torchattn::flex
