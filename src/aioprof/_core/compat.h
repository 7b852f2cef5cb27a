/* compat.h - every PY_VERSION_HEX check of aioprof lives here (CPython 3.10 to 3.13).
 *
 * Only public C API is used. Where an API appeared in a later version, the older
 * versions get an equivalent built from older public calls. */
#ifndef AP_COMPAT_H
#define AP_COMPAT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>

/* Exception save/restore around work done while an exception may be in flight
 * (e.g. a KeyboardInterrupt leaving a step). 3.12 replaced the (type, value, tb)
 * triple with a single exception object. */
#if PY_VERSION_HEX >= 0x030C0000
typedef struct { PyObject *exc; } ap_exc_state_t;
static inline void ap_exc_save(ap_exc_state_t *s) { s->exc = PyErr_GetRaisedException(); }
static inline void ap_exc_restore(ap_exc_state_t *s) { PyErr_SetRaisedException(s->exc); }
#else
typedef struct { PyObject *type, *value, *tb; } ap_exc_state_t;
static inline void ap_exc_save(ap_exc_state_t *s) { PyErr_Fetch(&s->type, &s->value, &s->tb); }
static inline void ap_exc_restore(ap_exc_state_t *s) { PyErr_Restore(s->type, s->value, s->tb); }
#endif

/* Py_NewRef / Py_XNewRef: 3.10 has them; kept here should the floor move down. */

/* The qualified name of a code object: co_qualname exists from 3.11; before that
 * co_name is the best the code object itself knows. Returns a new reference. */
static inline PyObject *ap_code_qualname(PyCodeObject *code)
{
#if PY_VERSION_HEX >= 0x030B0000
    return PyObject_GetAttrString((PyObject *)code, "co_qualname");
#else
    return PyObject_GetAttrString((PyObject *)code, "co_name");
#endif
}

/* PyEval_GetFrame returns a borrowed reference on every supported version. */
static inline PyFrameObject *ap_current_frame(void) { return PyEval_GetFrame(); }

#endif /* AP_COMPAT_H */
