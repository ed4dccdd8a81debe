/**
 * The only way the panel puts anything in the page: elements, text and attributes, never HTML. Every
 * string from the server (NVML names, process labels, notebook paths, messages) goes through here.
 */

const SVG_NS = 'http://www.w3.org/2000/svg';

export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className?: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

export function svg<K extends keyof SVGElementTagNameMap>(tag: K, attributes: Record<string, string> = {}): SVGElementTagNameMap[K] {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attributes)) {
    node.setAttribute(name, value);
  }
  return node;
}

export function setText(node: Element, text: string): void {
  if (node.textContent !== text) {
    node.textContent = text;
  }
}

export function setAttr(node: Element, name: string, value: string | null): void {
  if (value === null) {
    node.removeAttribute(name);
  } else if (node.getAttribute(name) !== value) {
    node.setAttribute(name, value);
  }
}

/** Make `parent`'s children exactly `children`, in order, moving only what is out of place. */
export function setChildren(parent: Element, children: readonly Node[]): void {
  children.forEach((child, i) => {
    if (parent.childNodes[i] !== child) {
      parent.insertBefore(child, parent.childNodes[i] ?? null);
    }
  });
  while (parent.childNodes.length > children.length) {
    parent.removeChild(parent.lastChild as ChildNode);
  }
}
